"""The one throughput definition: the job's frames over its longest learner loop."""
from asrdist.utils.throughput import job_frames_per_second, learner_frames_per_second


def test_job_throughput_is_total_frames_over_the_longest_loop():
    # a learner that stops early does not count as if it went on (the sum of rates would say 300)
    assert job_frames_per_second([100, 100], [1.0, 2.0]) == 100.0
    assert learner_frames_per_second(100, 1.0) + learner_frames_per_second(100, 2.0) == 150.0


def test_no_time_gives_zero_not_a_division_error():
    assert job_frames_per_second([], []) == 0.0
    assert job_frames_per_second([5], [0.0]) == 0.0
