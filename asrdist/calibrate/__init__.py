"""The measurements the simulator is calibrated on: one learner's step timed alone (`stepcost`), the
machine's co-run slowdown (`corun`), the link between two learners (`link`), the run's learners on
shared cores (`lockstep`), and one run's calibration from them (`microbench`). Above `run` and
`sim`, below `compare` and `bench`; derivations in docs/calibration.md."""
