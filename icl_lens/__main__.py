"""``python -m icl_lens ...`` runs the command line (and ``accelerate launch -m icl_lens sweep ...``)."""
import sys

from icl_lens.cli import main

sys.exit(main())
