"""openai-whisper's model as ferrum builds it: the encoder's attention against torch's fused one."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ferrum_cli.engine.model import EncoderAttention, attention_by_head


def test_attention_head_by_head_is_the_fused_attention_within_bfloat16_rounding():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 300, 64) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v)
    got = attention_by_head(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert got.dtype == torch.bfloat16 and got.shape == expected.shape
    torch.testing.assert_close(got.float(), expected, atol=0.02, rtol=0.02)
    torch.testing.assert_close(attention_by_head(q, k, v), expected, atol=1e-5, rtol=1e-5)  # the same sums


def test_the_encoder_runs_head_by_head_only_on_a_cpu_in_bfloat16():
    torch.manual_seed(0)
    attention = EncoderAttention(256, 4).eval()
    x = torch.randn(1, 1500, 256)
    with torch.no_grad():
        plain = attention(x)[0]
        fused = F.scaled_dot_product_attention(
            *(t(x).view(1, 1500, 4, 64).transpose(1, 2) for t in (attention.query, attention.key, attention.value))
        )
        assert torch.equal(plain, attention.out(fused.transpose(1, 2).flatten(2)))  # float32: torch's own
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = attention(x)[0]
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), plain, atol=0.05, rtol=0.05)


def test_where_head_by_head_is_not_the_faster_bfloat16_runs_torchs_fused_attention():
    """Neither is the faster on every CPU (engine.attention.cpu_attention_by_head measures them)."""
    from ferrum_cli.engine.model import use_attention_by_head

    torch.manual_seed(0)
    block = torch.nn.Module()
    block.attn = attention = EncoderAttention(256, 4).eval()
    x = torch.randn(1, 1500, 256)
    use_attention_by_head([block], False)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        fused = attention(x)[0]
        heads = (t(x).view(1, 1500, 4, 64).transpose(1, 2) for t in (attention.query, attention.key, attention.value))
        expected = attention.out(F.scaled_dot_product_attention(*heads).transpose(1, 2).flatten(2))
        use_attention_by_head([block], True)
        by_head = attention(x)[0]
    assert torch.equal(fused, expected) and not torch.equal(fused, by_head)
