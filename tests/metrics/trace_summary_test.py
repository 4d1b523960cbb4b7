#!/usr/bin/env python3
"""scripts/trace_summary.py's account of streams on synthetic Kineto traces: which stream is compute, how much of a
communication stream's time ran beside compute kernels and how much alone, and the printed lines."""
import importlib.util
import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "trace_summary.py")
spec = importlib.util.spec_from_file_location("trace_summary", SCRIPT)
trace_summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(trace_summary)


def kernel(name, stream, ts, dur):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "tid": f"stream {stream}",
            "args": {"stream": stream, "device": 0}}


# Compute on stream 7 busy 0-100 and 150-250 (idle 100-150); collectives on stream 13: 50-90 (beside compute) and
# 110-140 (alone: compute idle, the step waiting for it); an all-gather copy on stream 17 at 200-220 (beside).
TRACE = [
    kernel("sm90_xmma_gemm_bf16", 7, 0, 60), kernel("vectorized_elementwise_kernel", 7, 60, 40),
    kernel("sm90_xmma_gemm_bf16", 7, 150, 100),
    kernel("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", 13, 50, 40),
    kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 13, 110, 30),
    kernel("ncclDevKernel_AllGather_RING_LL", 17, 200, 20),
]


def printed_summary(trace, *flags):
    """What trace_summary.py prints for these events (written to a temporary trace file), and its exit status."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"traceEvents": trace}, f)
    out = io.StringIO()
    sys.argv = ["trace_summary.py", f.name, *flags]
    try:
        with redirect_stdout(out):
            status = trace_summary.main()
    finally:
        os.unlink(f.name)
    return out.getvalue(), status


class StreamAccount(unittest.TestCase):
    def test_overlap_and_exposed_time_per_stream(self):
        streams = trace_summary.stream_account(TRACE)
        self.assertEqual([s["stream"] for s in streams], [7, 13, 17])
        self.assertTrue(streams[0]["compute"])
        self.assertAlmostEqual(streams[0]["busy"], 200.0)
        self.assertAlmostEqual(streams[1]["busy"], 70.0)
        self.assertAlmostEqual(streams[1]["beside_compute"], 40.0)
        self.assertAlmostEqual(streams[1]["alone"], 30.0)
        self.assertAlmostEqual(streams[2]["beside_compute"], 20.0)
        self.assertAlmostEqual(streams[2]["alone"], 0.0)
        self.assertEqual(streams[1]["families"].most_common(1)[0][0], "collective")

    def test_printed_account(self):
        text, status = printed_summary(TRACE, "--steps", "1")
        self.assertEqual(status, 0)
        self.assertIn("stream 7 (compute): 3 kernels (matmul 0.16, elementwise 0.04), busy 0.20", text)
        self.assertIn("stream 13: 2 kernels (collective 0.07), busy 0.07; beside compute 0.04 (57%), alone with compute "
                      "idle 0.03", text)
        self.assertIn("collective", text)

    def test_idle_gaps_between_kernels_of_every_stream(self):
        # Busy 0-100 (compute, with stream 13 inside it), 110-140 (stream 13), 150-250: two gaps of 10 us. A gap of
        # 3 us is launch latency, not counted.
        intervals = [(float(k["ts"]), float(k["ts"]) + float(k["dur"])) for k in TRACE]
        self.assertEqual(trace_summary.idle_gaps(intervals, 5.0), (2, 20.0))
        self.assertEqual(trace_summary.idle_gaps(intervals + [(253.0, 260.0)], 5.0), (2, 20.0))
        self.assertEqual(trace_summary.idle_gaps(intervals, 15.0), (0, 0))
        text, _ = printed_summary(TRACE, "--steps", "2")
        self.assertIn("GPU idle between kernels: 1 gaps over 5 us, 0.01 ms a step", text)

    def test_data_movement_alone_counts_compute_on_every_stream(self):
        # A captured step's compute on two streams (7: 0-100, 9: 100-150) and the driver's copies standing in for a
        # one-rank group's collectives on stream 13: 90-120 runs beside compute throughout, 150-170 alone; an
        # all-reduce on 17 at 160-180 overlaps the second copy, 170-180 alone too.
        trace = [kernel("sm90_xmma_gemm_bf16", 7, 0, 100), kernel("vectorized_elementwise_kernel", 9, 100, 50),
                 kernel("memcpy32_post", 13, 90, 30), kernel("memcpy128", 13, 150, 20),
                 kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 17, 160, 20)]
        busy, alone, by_name = trace_summary.data_movement(trace)
        self.assertEqual((busy, alone), (60.0, 30.0))
        # Per kernel: memcpy32_post 90-120 beside compute; memcpy128 150-170 alone; the all-reduce 160-180, 170-180
        # alone.
        self.assertEqual(by_name, [("memcpy32_post", 30.0, 0.0), ("memcpy128", 20.0, 20.0),
                                   ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 20.0, 20.0)])
        # The per-stream account measures against stream 7 alone, the busiest: it counts the copy's 100-120, beside
        # stream 9's compute, as alone.
        copies = [s for s in trace_summary.stream_account(trace) if s["stream"] == 13][0]
        self.assertAlmostEqual(copies["alone"], 40.0)
        text, _ = printed_summary(trace, "--steps", "1")
        self.assertIn("collectives and device copies: 0.06 ms a step, 0.03 ms of it with no other kernel running "
                      "(memcpy32_post 0.03, alone 0.00, memcpy128 0.02, alone 0.02, ncclDevKernel_AllReduce_Sum_f32_RIN"
                      "G_LL 0.02, alone 0.02)",
                      text)

    def test_one_stream_has_no_account(self):
        text, _ = printed_summary(TRACE[:3])
        self.assertNotIn("streams (ms", text)


if __name__ == "__main__":
    unittest.main()
