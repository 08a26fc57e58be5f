from experiments.thought.run import main

raise SystemExit(main())
