"""``python -m clid.emlnet convert --trust-pickle IN.pth --out OUT.safetensors``: an EML-Net checkpoint's
tensors as safetensors, once, for ``01_saliency.py --method emlnet --weights`` (the network: :mod:`clid.selfgen.emlnet`)."""
from __future__ import annotations

import argparse
import pickle
import zipfile
from pathlib import Path

from clid.run.cli import HelpFormatter, run_main

CONVERT = "python -m clid.emlnet convert"  # the writer its run record names


def convert(source, out, trust_pickle: bool) -> int:
    """Write the tensors of a checkpoint as safetensors; returns their count. Unpickles the source
    (which can run code stored in it) only when ``trust_pickle`` is set. An existing ``out`` that this
    command did not write, or that changed since, is refused (:func:`clid.run.runs.check_own_output`)."""
    import torch  # (here, as the other imports: --help answers without loading torch)
    from safetensors.torch import save_file

    from clid.base.files import DataError, atomic_path, check_outputs
    from clid.run.runs import check_own_output, claim_output, file_state, write_own_record
    from clid.selfgen.emlnet import tensors_of

    source = Path(source)
    if not source.is_file():
        raise DataError(source, None, f"{'a folder, not a checkpoint file' if source.is_dir() else 'not found'}")
    check_outputs({"--out": out}, {"SOURCE": source})
    check_own_output(out, CONVERT)
    with open(source, "rb") as f:
        pickled = f.read(1) == b"\x80"  # a pickle's protocol mark (torch's legacy format)
    if not pickled and not zipfile.is_zipfile(source):
        raise DataError(source, None, "cannot read this file as a PyTorch checkpoint (neither torch's zip "
                                      "format nor a pickle)")
    try:
        state = torch.load(source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        if not trust_pickle:
            raise DataError(source, None, "holds more than tensors; reading it means unpickling it, which "
                                          "runs code stored in the file. Only for a file you trust: add "
                                          "--trust-pickle") from None
        print(f"note: unpickling {source} (--trust-pickle): code stored in the file runs")
        state = torch.load(source, map_location="cpu", weights_only=False)
    except Exception as err:
        raise DataError(source, None, f"cannot read this file as a PyTorch checkpoint ({err})") from None
    tensors = {k: v.detach().contiguous() for k, v in tensors_of(state, source).items()}
    claim_output(out, CONVERT)
    with atomic_path(out) as tmp:
        save_file(tensors, str(tmp))
    write_own_record(out, {"inputs": {"SOURCE": file_state(source)}, "settings": {}}, CONVERT)
    return len(tensors)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m clid.emlnet", formatter_class=HelpFormatter,
                                     description="Convert an EML-Net checkpoint to safetensors, once.")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("convert", help="write a .pth checkpoint's tensors as .safetensors", formatter_class=HelpFormatter)
    c.add_argument("source", help="the .pth checkpoint")
    c.add_argument("--out", required=True, help="the .safetensors file to write")
    c.add_argument("--trust-pickle", action="store_true",
                   help="unpickle the source if it holds more than tensors (a pickled module): this runs code "
                        "stored in the file, so use it only for a file you trust (the official EML-Net files hold "
                        "plain tensors and load without it)")
    args = parser.parse_args(argv)
    count = convert(args.source, args.out, args.trust_pickle)
    print(f"wrote {count} tensors to {args.out}; pass it to 01_saliency.py --weights")


if __name__ == "__main__":
    run_main(main)
