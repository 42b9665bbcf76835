"""One speech job end to end: prepare the run directory, start the learners, build each learner's
task, summarize; and the train / prepare / eval / decode / align commands."""
