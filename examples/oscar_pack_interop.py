#!/usr/bin/env python3
"""Convert rotation packs between this toolkit's HDF5 "oscar.pack" and the public OSCAR rotation files.

The public files are two torch.save'd dicts, one for K and one for V, read by the OSCAR SGLang
integration (`load_oscar_rotations`): {"format_version": 1, "objective": NAME, "source_grouping": ...,
"layers": {layer_id: {"layer_id": int, "rotation": fp32 [d, d] or [Hkv, d, d], "eigenvalues": ...}}},
rotation used as x_row @ rotation. See `--help` for the name mapping and what travels in extra keys.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

PACK_SCHEMA = "oscar.pack"
PACK_SCHEMA_VERSION = 1
PUBLIC_FORMAT_VERSION = 1

# Our composition name (R = U.H.P read left to right) -> the public reference's composition suffix.
COMPOSITION_TO_PUBLIC = {
    "none": "identity", "u": "plain", "h": "h", "p": "pbr", "u_p": "br", "u_h": "r_h", "u_h_p": "r_h_pbr",
    "h_p": "h_pbr", "u_p_h": "br_h128", "h_u_p": "h_r_pbr", "h_p_u": "h_pbr_r",
}
COMPOSITION_FROM_PUBLIC = {v: k for k, v in COMPOSITION_TO_PUBLIC.items()}
# Calibration targets -> the public objective prefixes ("qqt": C_Q for keys, "sst": the reference's
# softmax-free value proxy). The others have no public name; these are this script's own.
KEY_TARGET_TO_PUBLIC = {"query": "qqt", "gram": "kkt"}
VALUE_TARGET_TO_PUBLIC = {"proxy": "sst", "scores": "sst_softmax", "gram": "vvt"}
KEY_TARGET_FROM_PUBLIC = {v: k for k, v in KEY_TARGET_TO_PUBLIC.items()}
VALUE_TARGET_FROM_PUBLIC = {v: k for k, v in VALUE_TARGET_TO_PUBLIC.items()}
REFERENCE_CLIP = {"key": 0.96, "value": 0.92}  # the reference serving config's fixed ratios
PACK_ROOT_DEFAULTS = {
    "composition": "u_h_p", "scope": "layer", "clip_rule": "fixed", "key_target": "query",
    "value_target": "proxy", "group_size": 0, "sink_tokens": 64, "recent_tokens": 256,
    "stats_hash": "", "provenance": "",
}

EPILOG = """name mapping (ours -> public objective "<target>_<composition>"):
  compositions: none=identity u=plain p=pbr u_p=br u_h=r_h u_h_p=r_h_pbr h_p=h_pbr u_p_h=br_h128
                h_u_p=h_r_pbr h_p_u=h_pbr_r h=h
  key target query -> qqt (gram -> kkt); value target proxy -> sst (scores -> sst_softmax, gram -> vvt)
  files: k_rotation_<objective>.pt and v_rotation_<objective>.pt, e.g. k_rotation_qqt_r_h_pbr.pt
extra keys (ignored by the SGLang loader, used to make the round trip lossless): per layer
  "clip_ratio", "eigenvectors" (float64, when the pack has them); top level "oscar_pack" (the pack's
  root attributes). Eigenvalues are written as float64 (the pack's precision) unless
  --eigenvalues-float32. The SGLang integration takes clip ratios from SGLANG_OSCAR_K_CLIP_RATIO /
  SGLANG_OSCAR_V_CLIP_RATIO, not from the files.

examples:
  python examples/oscar_pack_interop.py to-torch pack.h5 -o rotations/
  SGLANG_OSCAR_K_ROTATION_PATH=rotations/k_rotation_qqt_r_h_pbr.pt \\
  SGLANG_OSCAR_V_ROTATION_PATH=rotations/v_rotation_sst_r_h_pbr.pt  ...   # their server
  python examples/oscar_pack_interop.py to-pack --k k_rotation_qqt_r_h_pbr.pt --v v_rotation_sst_r_h_pbr.pt \\
      --geometry-from data/smollm2-eval.h5 -o released.h5"""


class InteropError(Exception):
    pass


def need(module_name):
    try:
        return __import__(module_name)
    except ImportError as e:
        raise InteropError(f"this conversion needs the Python package '{module_name}' ({e}); "
                           "see examples/requirements-capture.txt")


def _attr_str(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def read_pack(path):
    """Our HDF5 pack -> plain dict {attrs, layers: {l: {side: {rotation, eigenvalues, eigenvectors?, clip_ratio}}}}."""
    h5py, np = need("h5py"), need("numpy")
    if not os.path.isfile(path):
        raise InteropError(f"{path}: no such file")
    with h5py.File(path, "r") as f:
        schema = _attr_str(f.attrs.get("schema", ""))
        if schema != PACK_SCHEMA:
            raise InteropError(f"{path}: schema is '{schema}', expected '{PACK_SCHEMA}'")
        attrs = {}
        for key, value in f.attrs.items():
            attrs[key] = _attr_str(value) if isinstance(value, (str, bytes)) else value.item() if hasattr(value, "item") else value
        for key in ("num_layers", "head_dim"):
            if key not in attrs:
                raise InteropError(f"{path}: root attribute '{key}' missing")
        d = int(attrs["head_dim"])
        if "layers" not in f:
            raise InteropError(f"{path}: no /layers group")
        layers = {}
        for name in f["layers"]:
            if not name.isdigit():
                raise InteropError(f"{path}: /layers/{name} is not a decimal layer index")
            entry = {}
            for side in ("key", "value"):
                g = f"layers/{name}/{side}"
                if g not in f or "rotation" not in f[g] or "eigenvalues" not in f[g]:
                    raise InteropError(f"{path}: /{g} must hold 'rotation' and 'eigenvalues'")
                rot = np.asarray(f[g]["rotation"][...])
                if rot.shape[-2:] != (d, d) or rot.ndim not in (2, 3):
                    raise InteropError(f"{path}: /{g}/rotation has shape {rot.shape}, expected [{d}, {d}] or [Hkv, {d}, {d}]")
                if "clip_ratio" not in f[g].attrs:
                    raise InteropError(f"{path}: /{g} has no clip_ratio attribute")
                entry[side] = {
                    "rotation": rot.astype(np.float32),
                    "eigenvalues": np.asarray(f[g]["eigenvalues"][...], dtype=np.float64),
                    "clip_ratio": float(f[g].attrs["clip_ratio"]),
                }
                if "eigenvectors" in f[g]:
                    entry[side]["eigenvectors"] = np.asarray(f[g]["eigenvectors"][...], dtype=np.float64)
            layers[int(name)] = entry
    if not layers:
        raise InteropError(f"{path}: no layers under /layers")
    return {"attrs": attrs, "layers": layers}


def write_pack(path, pack):
    h5py, np = need("h5py"), need("numpy")
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with h5py.File(tmp, "w") as f:
            for key, value in pack["attrs"].items():
                f.attrs[key] = value
            for layer in sorted(pack["layers"]):
                for side in ("key", "value"):
                    s = pack["layers"][layer][side]
                    g = f.create_group(f"layers/{layer}/{side}")
                    g.create_dataset("rotation", data=np.asarray(s["rotation"], dtype=np.float32))
                    g.create_dataset("eigenvalues", data=np.asarray(s["eigenvalues"], dtype=np.float64))
                    if s.get("eigenvectors") is not None:
                        g.create_dataset("eigenvectors", data=np.asarray(s["eigenvectors"], dtype=np.float64))
                    g.attrs["clip_ratio"] = float(s["clip_ratio"])
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def public_objectives(attrs):
    comp = str(attrs.get("composition", PACK_ROOT_DEFAULTS["composition"]))
    comp_public = COMPOSITION_TO_PUBLIC.get(comp, comp)
    k = KEY_TARGET_TO_PUBLIC.get(str(attrs.get("key_target", "query")), str(attrs.get("key_target")))
    v = VALUE_TARGET_TO_PUBLIC.get(str(attrs.get("value_target", "proxy")), str(attrs.get("value_target")))
    return f"{k}_{comp_public}", f"{v}_{comp_public}"


def orthogonality_error(np, rotation):
    r = np.asarray(rotation, dtype=np.float64)
    r = r[None] if r.ndim == 2 else r
    eye = np.eye(r.shape[-1])
    return float(max(np.abs(m @ m.T - eye).max() for m in r))


def pack_to_public(pack, eigenvalues_float32=False):
    """-> (k_dict, v_dict) in the public layout (torch tensors)."""
    torch, np = need("torch"), need("numpy")
    k_obj, v_obj = public_objectives(pack["attrs"])
    scope = str(pack["attrs"].get("scope", "layer"))
    out = {}
    for side, objective in (("key", k_obj), ("value", v_obj)):
        result = {"format_version": PUBLIC_FORMAT_VERSION, "objective": objective,
                  "source_grouping": "head" if scope == "head" else "layer", "layers": {},
                  "oscar_pack": {k: (v if isinstance(v, (str, int, float)) else str(v)) for k, v in pack["attrs"].items()}}
        for layer in sorted(pack["layers"]):
            s = pack["layers"][layer][side]
            ev = torch.from_numpy(np.ascontiguousarray(s["eigenvalues"], dtype=np.float64))
            entry = {"layer_id": int(layer),
                     "rotation": torch.from_numpy(np.ascontiguousarray(s["rotation"], dtype=np.float32)),
                     "eigenvalues": ev.float() if eigenvalues_float32 else ev,
                     "clip_ratio": float(s["clip_ratio"])}
            if s.get("eigenvectors") is not None:
                entry["eigenvectors"] = torch.from_numpy(np.ascontiguousarray(s["eigenvectors"], dtype=np.float64))
            result["layers"][int(layer)] = entry
        out[side] = result
    return out["key"], out["value"]


def load_public(path):
    torch = need("torch")
    if not os.path.isfile(path):
        raise InteropError(f"{path}: no such file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise InteropError(f"{path}: cannot torch.load it ({type(e).__name__}: {e})")
    if not isinstance(state, dict) or not isinstance(state.get("layers"), dict) or not state["layers"]:
        raise InteropError(f"{path}: not an OSCAR rotation file (needs a non-empty 'layers' dict)")
    fv = state.get("format_version", 1)
    if fv != PUBLIC_FORMAT_VERSION:
        raise InteropError(f"{path}: format_version {fv}, this script reads {PUBLIC_FORMAT_VERSION}")
    return state


def split_objective(objective, prefixes):
    for prefix in sorted(prefixes, key=len, reverse=True):
        if objective == prefix or objective.startswith(prefix + "_"):
            return prefix, objective[len(prefix) + 1:]
    return None, objective


def public_to_pack(k_state, v_state, k_path="K", v_path="V", num_layers=None, num_kv_heads=None,
                   k_clip=None, v_clip=None):
    np = need("numpy")
    saved = k_state.get("oscar_pack") or v_state.get("oscar_pack") or {}
    attrs = dict(PACK_ROOT_DEFAULTS)
    attrs.update({k: v for k, v in saved.items()})
    k_prefix, k_comp = split_objective(str(k_state.get("objective", "")), KEY_TARGET_FROM_PUBLIC)
    v_prefix, v_comp = split_objective(str(v_state.get("objective", "")), VALUE_TARGET_FROM_PUBLIC)
    if not saved:
        if k_comp and v_comp and k_comp != v_comp:
            print(f"warning: K objective '{k_state.get('objective')}' and V objective '{v_state.get('objective')}' "
                  f"name different compositions; recording the key's", file=sys.stderr)
        if k_comp:
            attrs["composition"] = COMPOSITION_FROM_PUBLIC.get(k_comp, k_comp)
        if k_prefix:
            attrs["key_target"] = KEY_TARGET_FROM_PUBLIC[k_prefix]
        if v_prefix:
            attrs["value_target"] = VALUE_TARGET_FROM_PUBLIC[v_prefix]
        attrs["provenance"] = json.dumps({"tool": "examples/oscar_pack_interop.py to-pack", "key_file": k_path,
                                          "value_file": v_path, "key_objective": k_state.get("objective"),
                                          "value_objective": v_state.get("objective")}, sort_keys=True)

    def layer_map(state, path):
        out = {}
        for key, entry in state["layers"].items():
            try:
                layer = int(key)
            except (TypeError, ValueError):
                raise InteropError(f"{path}: layer key {key!r} is not an integer")
            if not isinstance(entry, dict) or "rotation" not in entry:
                raise InteropError(f"{path}: layer {layer} has no 'rotation'")
            out[layer] = entry
        return out

    k_layers, v_layers = layer_map(k_state, k_path), layer_map(v_state, v_path)
    if set(k_layers) != set(v_layers):
        raise InteropError(f"{k_path} and {v_path} cover different layers: {sorted(k_layers)} vs {sorted(v_layers)}")
    layers, d, heads = {}, None, None
    for layer in sorted(k_layers):
        entry = {}
        for side, src, path, clip in (("key", k_layers[layer], k_path, k_clip), ("value", v_layers[layer], v_path, v_clip)):
            rot = src["rotation"].detach().cpu().float().numpy()
            if rot.ndim not in (2, 3) or rot.shape[-1] != rot.shape[-2]:
                raise InteropError(f"{path}: layer {layer} rotation has shape {tuple(rot.shape)}, expected [d, d] or [Hkv, d, d]")
            d = d or rot.shape[-1]
            if rot.shape[-1] != d:
                raise InteropError(f"{path}: layer {layer} rotation is {rot.shape[-1]} wide, others are {d}")
            h = rot.shape[0] if rot.ndim == 3 else 1
            heads = heads or h
            if h != heads:
                raise InteropError(f"{path}: layer {layer} has {h} rotations, others have {heads}")
            err = orthogonality_error(np, rot)
            if err > 1e-3:
                raise InteropError(f"{path}: layer {layer} rotation is not orthogonal (max |R R^T - I| = {err:.3g})")
            ev = src.get("eigenvalues")
            if ev is None:
                ev_np = np.zeros(rot.shape[:-1], dtype=np.float64)  # unknown: released files may omit them
                print(f"warning: {path}: layer {layer} has no eigenvalues; writing zeros", file=sys.stderr)
            else:
                ev_np = ev.detach().cpu().double().numpy().reshape(rot.shape[:-1])
            ratio = clip if clip is not None else src.get("clip_ratio", REFERENCE_CLIP[side])
            entry[side] = {"rotation": rot, "eigenvalues": ev_np, "clip_ratio": float(ratio)}
            if src.get("eigenvectors") is not None:
                entry[side]["eigenvectors"] = src["eigenvectors"].detach().cpu().double().numpy()
        layers[layer] = entry
    attrs["schema"] = PACK_SCHEMA
    attrs["schema_version"] = int(attrs.get("schema_version", PACK_SCHEMA_VERSION))
    attrs["head_dim"] = int(d)
    attrs["scope"] = "head" if heads > 1 else str(attrs.get("scope", "layer"))
    if num_layers is not None:
        attrs["num_layers"] = int(num_layers)
    elif "num_layers" not in saved:
        attrs["num_layers"] = max(layers) + 1
    if num_kv_heads is not None:
        attrs["num_kv_heads"] = int(num_kv_heads)
    elif "num_kv_heads" not in saved:
        if heads == 1:
            raise InteropError("per-layer rotations do not tell the number of KV heads: give --num-kv-heads "
                               "or --geometry-from DUMP.h5")
        attrs["num_kv_heads"] = int(heads)
    if heads > 1 and int(attrs["num_kv_heads"]) != heads:
        raise InteropError(f"per-head rotations for {heads} KV heads but num_kv_heads is {attrs['num_kv_heads']}")
    if max(layers) >= int(attrs["num_layers"]):
        raise InteropError(f"layer {max(layers)} outside num_layers {attrs['num_layers']}")
    for key in ("num_layers", "num_kv_heads", "head_dim", "group_size", "sink_tokens", "recent_tokens", "schema_version"):
        attrs[key] = int(attrs[key])
    return {"attrs": attrs, "layers": layers}


def geometry_from(path):
    h5py = need("h5py")
    if not os.path.isfile(path):
        raise InteropError(f"{path}: no such file")
    with h5py.File(path, "r") as f:
        try:
            return int(f.attrs["num_layers"]), int(f.attrs["num_kv_heads"]), int(f.attrs["head_dim"])
        except KeyError as e:
            raise InteropError(f"{path}: root attribute {e} missing (need num_layers, num_kv_heads, head_dim)")


def save_torch(obj, path):
    torch = need("torch")
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def main(argv=None):
    p = argparse.ArgumentParser(prog="oscar_pack_interop.py", description=__doc__.strip().splitlines()[0],
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version="oscar_pack_interop.py (oscar.pack v1 <-> OSCAR rotation files v1)")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("to-torch", help="our HDF5 pack -> k_rotation_*.pt and v_rotation_*.pt")
    t.add_argument("pack", help="oscar.pack HDF5 file")
    t.add_argument("-o", "--output-dir", required=True, help="folder for the two .pt files (created)")
    t.add_argument("--k-name", default=None, help="file name of the K file (default k_rotation_<objective>.pt)")
    t.add_argument("--v-name", default=None, help="file name of the V file (default v_rotation_<objective>.pt)")
    t.add_argument("--eigenvalues-float32", action="store_true", help="store eigenvalues as float32 like the reference pipeline")
    b = sub.add_parser("to-pack", help="public K and V rotation files -> our HDF5 pack")
    b.add_argument("--k", required=True, help="K rotation file (torch.save'd dict)")
    b.add_argument("--v", required=True, help="V rotation file (torch.save'd dict)")
    b.add_argument("-o", "--output", required=True, help="oscar.pack HDF5 file to write")
    b.add_argument("--geometry-from", default=None, help="a dump or raw file whose num_layers / num_kv_heads / head_dim to use")
    b.add_argument("--num-layers", type=int, default=None, help="model layers (default: from the files, else max layer + 1)")
    b.add_argument("--num-kv-heads", type=int, default=None, help="KV heads (needed for per-layer rotations without our extra keys)")
    b.add_argument("--k-clip", type=float, default=None, help=f"key clip ratio (default: from the file, else {REFERENCE_CLIP['key']})")
    b.add_argument("--v-clip", type=float, default=None, help=f"value clip ratio (default: from the file, else {REFERENCE_CLIP['value']})")
    args = p.parse_args(argv)
    try:
        if args.command == "to-torch":
            np = need("numpy")
            pack = read_pack(args.pack)
            for layer, entry in pack["layers"].items():
                for side in ("key", "value"):
                    err = orthogonality_error(np, entry[side]["rotation"])
                    if err > 1e-3:
                        raise InteropError(f"{args.pack}: /layers/{layer}/{side}/rotation is not orthogonal ({err:.3g})")
            k_obj, v_obj = public_objectives(pack["attrs"])
            k_state, v_state = pack_to_public(pack, args.eigenvalues_float32)
            os.makedirs(args.output_dir, exist_ok=True)
            k_path = os.path.join(args.output_dir, args.k_name or f"k_rotation_{k_obj}.pt")
            v_path = os.path.join(args.output_dir, args.v_name or f"v_rotation_{v_obj}.pt")
            save_torch(k_state, k_path)
            save_torch(v_state, v_path)
            print(k_path)
            print(v_path)
        else:
            num_layers, num_kv_heads = args.num_layers, args.num_kv_heads
            if args.geometry_from:
                gl, gh, gd = geometry_from(args.geometry_from)
                num_layers = num_layers if num_layers is not None else gl
                num_kv_heads = num_kv_heads if num_kv_heads is not None else gh
            for name, clip in (("--k-clip", args.k_clip), ("--v-clip", args.v_clip)):
                if clip is not None and not 0 < clip <= 1:
                    raise InteropError(f"{name} {clip} outside (0, 1]")
            pack = public_to_pack(load_public(args.k), load_public(args.v), args.k, args.v,
                                  num_layers, num_kv_heads, args.k_clip, args.v_clip)
            if args.geometry_from and pack["attrs"]["head_dim"] != gd:
                raise InteropError(f"rotations are {pack['attrs']['head_dim']} wide but {args.geometry_from} has head_dim {gd}")
            write_pack(args.output, pack)
            print(args.output)
    except InteropError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
