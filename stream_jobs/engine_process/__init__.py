"""The engine in a child process: the process, the window on the wire, the child, its
heartbeat and its memory policy."""
