"""Applications of lltm_ffi, apart from the library: the demo's training
runs (`make demo`; `python -m examples.demo`, README) and pytorch/examples'
word language model with LLTMSequence (`python -m
examples.word_language_model`)."""
