"""benchmark.py's modes: the tutorial's single run (tutorial), --compare,
--kernels, --overhead, --sequence, --accuracy and --distributed, one module
each, on the shared harness; --half and --autocast (precision) for
--sequence and --accuracy; the command line is in cli."""
