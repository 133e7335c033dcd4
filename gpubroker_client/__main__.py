from gpubroker_client.cli import main

raise SystemExit(main())
