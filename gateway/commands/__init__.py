"""The ``privgw`` command line: its entry (SIGTERM from the first moment), parser, exit
codes and what every front end shares."""
