#!/usr/bin/env python3
"""Round trip of examples/oscar_pack_interop.py: an oscar.pack made here with h5py -> public OSCAR
rotation files -> oscar.pack must give back the same datasets and attributes; a bare public file
(no extra keys) must convert with the reference defaults. Exit 0 pass, 1 fail, 77 skip (no torch/h5py)."""
import contextlib
import importlib.util
import io
import os
import subprocess
import sys
import tempfile

try:
    import h5py
    import numpy as np
    import torch
except ImportError as e:
    print(f"SKIP: test_pack_interop needs numpy, h5py and torch ({e}); "
          "install examples/requirements-capture.txt into a virtual environment")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "examples", "oscar_pack_interop.py")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}")


_spec = importlib.util.spec_from_file_location("oscar_pack_interop", SCRIPT)
interop = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(interop)


class Result:
    def __init__(self, returncode, stdout, stderr):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def run(*args, expect=0, subprocess_cli=False):
    """Runs the converter in this process (fast); subprocess_cli=True goes through the real CLI."""
    if subprocess_cli:
        r = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)
    else:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = interop.main(list(args))
            except SystemExit as e:
                code = e.code
        r = Result(code, out.getvalue(), err.getvalue())
    if r.returncode != expect:
        failures.append(f"{' '.join(args)} exited {r.returncode}, expected {expect}")
        print(f"FAIL: {' '.join(args)} -> {r.returncode}\n{r.stdout}{r.stderr}")
    return r


def orthogonal(rng, d):
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    return (q * np.sign(np.diag(r))).astype(np.float32)


def make_pack(path, rng, layers, num_layers, kv_heads, d, scope, eigenvectors):
    heads = kv_heads if scope == "head" else 1
    with h5py.File(path, "w") as f:
        f.attrs.update({"schema": "oscar.pack", "schema_version": 1, "num_layers": num_layers,
                        "num_kv_heads": kv_heads, "head_dim": d, "composition": "u_h_p", "scope": scope,
                        "clip_rule": "fit", "key_target": "query", "value_target": "proxy", "group_size": 0,
                        "sink_tokens": 64, "recent_tokens": 256, "stats_hash": "abc123",
                        "provenance": '{"tool": "test"}'})
        for l in layers:
            for side, clip in (("key", 0.96 - l * 0.01), ("value", 0.875)):
                g = f.create_group(f"layers/{l}/{side}")
                rot = np.stack([orthogonal(rng, d) for _ in range(heads)])
                ev = np.sort(rng.random((heads, d)) * 10 ** rng.uniform(-3, 3), axis=-1)
                if scope == "layer":
                    rot, ev = rot[0], ev[0]
                g.create_dataset("rotation", data=rot)
                g.create_dataset("eigenvalues", data=ev)  # float64
                if eigenvectors:
                    g.create_dataset("eigenvectors", data=rot.astype(np.float64) @ np.eye(d))
                g.attrs["clip_ratio"] = clip


def h5_contents(path):
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in obj.attrs.items()}
            if isinstance(obj, h5py.Dataset):
                out[name] = (obj.dtype.str, obj[...], attrs)
            else:
                out[name] = (None, None, attrs)
        out["/"] = (None, None, {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()})
        f.visititems(visit)
    return out


def same_h5(a, b, label):
    ca, cb = h5_contents(a), h5_contents(b)
    check(sorted(ca) == sorted(cb), f"{label}: same objects ({sorted(set(ca) ^ set(cb))})")
    for name in ca:
        if name not in cb:
            continue
        (ta, da, aa), (tb, db, ab) = ca[name], cb[name]
        check(ta == tb, f"{label}: {name} dtype {ta} vs {tb}")
        if da is not None and db is not None:
            check(da.shape == db.shape and np.array_equal(da, db), f"{label}: {name} values equal")
        check(sorted(aa) == sorted(ab), f"{label}: {name} attribute names {sorted(aa)} vs {sorted(ab)}")
        for k in aa:
            if k in ab:
                check(np.array_equal(np.asarray(aa[k]), np.asarray(ab[k])), f"{label}: {name} attribute {k}: {aa[k]!r} vs {ab[k]!r}")


def main():
    rng = np.random.default_rng(20261122)
    with tempfile.TemporaryDirectory() as tmp:
        for scope, d, kv, layers, eigvecs in (("layer", 8, 3, [0, 2, 5], True), ("head", 4, 3, [1], False),
                                              ("layer", 1, 1, [0], False)):
            label = f"scope {scope} d {d}"
            pack = os.path.join(tmp, f"pack-{scope}-{d}.h5")
            make_pack(pack, rng, layers, 6, kv, d, scope, eigvecs)
            outdir = os.path.join(tmp, f"pt-{scope}-{d}")
            r = run("to-torch", pack, "-o", outdir, subprocess_cli=(scope == "layer" and d == 8))
            k_path = os.path.join(outdir, "k_rotation_qqt_r_h_pbr.pt")
            v_path = os.path.join(outdir, "v_rotation_sst_r_h_pbr.pt")
            check(r.stdout.split() == [k_path, v_path], f"{label}: to-torch prints the two paths")
            # What the SGLang integration reads: state["layers"][layer_id]["rotation"], [d, d] or [Hkv, d, d].
            k = torch.load(k_path, map_location="cpu", weights_only=True)
            v = torch.load(v_path, map_location="cpu", weights_only=True)
            check(k["format_version"] == 1 and v["format_version"] == 1, f"{label}: format_version 1")
            check(k["objective"] == "qqt_r_h_pbr" and v["objective"] == "sst_r_h_pbr", f"{label}: objective names")
            check(sorted(k["layers"]) == layers, f"{label}: integer layer keys {sorted(k['layers'])}")
            with h5py.File(pack, "r") as f:
                for l in layers:
                    for state, side in ((k, "key"), (v, "value")):
                        e = state["layers"][l]
                        want = f[f"layers/{l}/{side}/rotation"][...]
                        check(e["layer_id"] == l, f"{label}: layer_id {l}")
                        check(e["rotation"].dtype == torch.float32, f"{label}: rotation is fp32")
                        check(tuple(e["rotation"].shape) == want.shape, f"{label}: rotation shape")
                        check(np.array_equal(e["rotation"].numpy(), want), f"{label}: layer {l} {side} rotation equal")
                        check(np.array_equal(e["eigenvalues"].numpy(), f[f"layers/{l}/{side}/eigenvalues"][...]),
                              f"{label}: layer {l} {side} eigenvalues equal")
                        check(e["clip_ratio"] == f[f"layers/{l}/{side}"].attrs["clip_ratio"], f"{label}: clip ratio")
            back = os.path.join(tmp, f"back-{scope}-{d}.h5")
            run("to-pack", "--k", k_path, "--v", v_path, "-o", back)
            same_h5(pack, back, label)

        # A bare public file, as the reference pipeline writes it: no extra keys, fp32 eigenvalues.
        d, layers = 8, [0, 3]
        bare = {}
        for side, objective in (("k", "qqt_r_h_pbr"), ("v", "sst_r_h_pbr")):
            state = {"format_version": 1, "objective": objective, "source_grouping": "layer", "layers": {}}
            for l in layers:
                state["layers"][l] = {"layer_id": l, "rotation": torch.from_numpy(orthogonal(rng, d)),
                                      "eigenvalues": torch.linspace(0.1, 5.0, d)}
            bare[side] = os.path.join(tmp, f"{side}_bare.pt")
            torch.save(state, bare[side])
        out = os.path.join(tmp, "from-bare.h5")
        r = run("to-pack", "--k", bare["k"], "--v", bare["v"], "-o", out, expect=1)
        check("--num-kv-heads" in r.stderr, "bare per-layer files need --num-kv-heads (clear error)")
        check(not os.path.exists(out), "no partial output after an error")
        run("to-pack", "--k", bare["k"], "--v", bare["v"], "-o", out, "--num-kv-heads", "3", "--num-layers", "30")
        with h5py.File(out, "r") as f:
            a = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
            check(a["schema"] == "oscar.pack" and a["schema_version"] == 1, "bare: schema")
            check(a["composition"] == "u_h_p" and a["key_target"] == "query" and a["value_target"] == "proxy",
                  f"bare: names mapped ({a['composition']}, {a['key_target']}, {a['value_target']})")
            check(a["num_layers"] == 30 and a["num_kv_heads"] == 3 and a["head_dim"] == d and a["scope"] == "layer",
                  "bare: geometry")
            check(abs(f["layers/0/key"].attrs["clip_ratio"] - 0.96) < 1e-12 and
                  abs(f["layers/0/value"].attrs["clip_ratio"] - 0.92) < 1e-12, "bare: reference clip ratios")
            k_state = torch.load(bare["k"], weights_only=True)
            for l in layers:
                check(np.array_equal(f[f"layers/{l}/key/rotation"][...], k_state["layers"][l]["rotation"].numpy()),
                      f"bare: layer {l} key rotation equal")
                check(np.array_equal(f[f"layers/{l}/key/eigenvalues"][...],
                                     k_state["layers"][l]["eigenvalues"].double().numpy()), f"bare: layer {l} eigenvalues")
        # ... and our pack made from it goes back to the same public tensors.
        outdir = os.path.join(tmp, "pt-bare")
        run("to-torch", out, "-o", outdir, "--eigenvalues-float32")
        k2 = torch.load(os.path.join(outdir, "k_rotation_qqt_r_h_pbr.pt"), weights_only=True)
        for l in layers:
            check(torch.equal(k2["layers"][l]["rotation"], k_state["layers"][l]["rotation"]) and
                  torch.equal(k2["layers"][l]["eigenvalues"], k_state["layers"][l]["eigenvalues"]),
                  f"bare: layer {l} survives the second trip")

        # A non-orthogonal rotation is refused with one clear line and no output.
        bad = dict(torch.load(bare["k"], weights_only=True))
        bad["layers"][0]["rotation"] = bad["layers"][0]["rotation"] * 2
        torch.save(bad, os.path.join(tmp, "bad.pt"))
        r = run("to-pack", "--k", os.path.join(tmp, "bad.pt"), "--v", bare["v"], "-o", os.path.join(tmp, "bad.h5"),
                "--num-kv-heads", "3", expect=1)
        check(r.stderr.startswith("error: ") and "orthogonal" in r.stderr, "non-orthogonal rotation refused")
        check(not os.path.exists(os.path.join(tmp, "bad.h5")), "no output for a bad input")
    n_fail = len(failures)
    print(f"test_pack_interop: {'1 passed, 0 failed' if not n_fail else '0 passed, 1 failed'}")
    return 0 if not n_fail else 1


if __name__ == "__main__":
    sys.exit(main())
