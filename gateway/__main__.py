from gateway.commands.launch import main

raise SystemExit(main())
