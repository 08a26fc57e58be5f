from experiments.spikes.run import main

main()
