from gateway.launch import main

raise SystemExit(main())
