"""What count_step counts as a host-device sync: only what a step asks for, and where it asked."""

import torch

from rosetta_trainer.engine.step_counters import STEP_MARK, count_step, counts_of


def test_a_read_of_a_value_in_the_step_is_one_sync_per_step():
    x = torch.randn(8, requires_grad=True)

    def step():
        loss = (x * x).sum()
        loss.backward()
        return loss.item()

    counts = count_step(step, steps=3)
    assert counts.syncs == 1
    assert sum(counts.sync_sites.values()) == 3


def test_syncs_outside_every_step_are_the_measurements_own():
    x = torch.randn(8)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            with torch.profiler.record_function(STEP_MARK):
                x.mul(2).sum()
        x.sum().item()  # after the steps, as count_step's final wait on a GPU
    assert counts_of(prof.events(), steps=2).syncs == 0


def test_without_a_python_frame_the_site_names_the_operators_it_ran_under():
    class ReadsInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t * 2

        @staticmethod
        def backward(ctx, grad):
            grad.sum().item()
            return grad * 2

    x = torch.randn(4, requires_grad=True)
    counts = count_step(lambda: ReadsInBackward.apply(x).sum().backward(), steps=1, where=False)
    assert counts.syncs == 1
    (site,) = counts.sync_sites
    assert "ReadsInBackward" in site and site.endswith("aten::_local_scalar_dense"), site


def test_a_gpu_steps_kernels_are_grouped_by_name():
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    def event(i, name, start, end, device=DeviceType.CPU):
        return FunctionEvent(id=i, name=name, thread=0, start_us=start, end_us=end, device_type=device)

    gemm = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute"
    events = [event(0, STEP_MARK, 0, 100), event(1, gemm, 10, 20, DeviceType.CUDA),
              event(2, gemm + "_other_tile", 20, 30, DeviceType.CUDA),
              event(3, "triton_poi_fused_add_0", 30, 40, DeviceType.CUDA),
              event(4, "cudaDeviceSynchronize", 150, 160)]
    counts = counts_of(events, steps=1, cuda=True)
    assert (counts.kernels, counts.syncs) == (3, 0)
    assert counts.kernel_names == {gemm[:60]: 2, "triton_poi_fused_add_0": 1}
