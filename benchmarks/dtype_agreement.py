"""How far bf16 moves each method's next-token logits from its own fp32 run: the noise floor against which
eviction-vs-masking differences in bf16 are read (benchmarks/gpu_decode.py reports those).

Qwen3-8B's geometry at full depth with random weights (benchmarks/gpu_decode.py builds it), one fp32 copy: the full
cache, kvpress's DMSPress and KVzapPress (ratio ~0.75, decoding-time pruning) decode the same forced tokens in fp32,
then again after casting the model to bf16. Random deep networks amplify rounding, so large bf16-vs-fp32 gaps for
the full cache itself mean bf16 comparisons between methods say nothing about exactness; fp32 ones do.

    python benchmarks/dtype_agreement.py --out benchmarks/results/dtype_agreement_h200.json   # one H200: ~40 s
    python benchmarks/dtype_agreement.py --tiny --context 600 --out /tmp/agreement.json         # small, on CPU
"""

from __future__ import annotations

import argparse

import torch
from kvpress import DMSPress

from gpu_decode import QWEN3_8B, TINY, agreement, build_model, run_method
from kvzap.atomic import atomic_write_json
from kvzap.pruning import KVzapPress, SurrogateScorerPress
from kvzap.pruning.calibration import collect_scores, threshold_for
from kvzap.surrogate.model import Surrogate
from records import output_file, positive_int, unit_fraction


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=output_file, required=True)
    parser.add_argument(
        "--context", type=positive_int, default=8192, help="fp32 sdpa on GPU holds heads x context^2 floats"
    )
    parser.add_argument("--ratio", type=unit_fraction, default=0.75)
    parser.add_argument("--decode-steps", type=positive_int, default=16)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    geometry = TINY if args.tiny else QWEN3_8B
    model = build_model(geometry, args.device, torch.float32)
    gen = torch.Generator().manual_seed(0)
    calibration = max(1024, args.context // 2)  # its removable share (1 - 128 / length) must exceed the ratio
    ids = torch.randint(0, geometry["vocab_size"], (1, args.context + calibration), generator=gen)
    calibration_ids, ids = ids[:, :calibration], ids[:, calibration:].to(args.device)
    torch.manual_seed(0)
    surrogate = Surrogate(geometry["hidden_size"], geometry["num_key_value_heads"], geometry["num_hidden_layers"])
    scorer = SurrogateScorerPress(surrogate=surrogate)
    tau = threshold_for(collect_scores(model, [calibration_ids], scorer), args.ratio)
    presses = {
        "full": lambda: None,
        "masking": lambda: DMSPress(scorer, threshold=tau, sliding_window_size=128, decoding=True),
        "eviction": lambda: KVzapPress(scorer, threshold=tau, window=128, decoding=True),
    }

    fp32 = {"full": run_method(model, None, ids, args.decode_steps)}
    forced = fp32["full"]["tokens"]
    for name in ("masking", "eviction"):
        fp32[name] = run_method(model, presses[name](), ids, args.decode_steps, forced)
    model.to(torch.bfloat16)
    bf16 = {name: run_method(model, press(), ids, args.decode_steps, forced) for name, press in presses.items()}
    record = {
        "context_tokens": args.context,
        "target_ratio": args.ratio,
        "compression_ratio": fp32["eviction"]["ratio"],
        "eviction_vs_masking": {
            "float32": agreement(fp32["eviction"], fp32["masking"]),
            "bfloat16": agreement(bf16["eviction"], bf16["masking"]),
        },
        "bfloat16_vs_float32": {name: agreement(bf16[name], fp32[name]) for name in presses},
        "logit_scale_float32": fp32["full"]["logits"].abs().max().item(),
        "decode_steps": args.decode_steps,
        "layers": geometry["num_hidden_layers"],
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
    }
    atomic_write_json(args.out, [record])
    for key in ("eviction_vs_masking", "bfloat16_vs_float32"):
        for name, value in record[key].items():
            print(
                f"{key} [{name}]: max |logit diff| {value['max_abs_logit_diff']:.3g}, "
                f"same argmax {value['same_argmax']:.3f}"
            )


if __name__ == "__main__":
    main()
