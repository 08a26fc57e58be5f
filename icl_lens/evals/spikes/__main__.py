from icl_lens.evals.spikes.run import main

main()
