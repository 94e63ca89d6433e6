"""benchmark.py's modes: the tutorial's single run (tutorial), --compare,
--kernels, --overhead, --sequence and --autocast, one module each, on the
shared harness; the command line is in cli."""
