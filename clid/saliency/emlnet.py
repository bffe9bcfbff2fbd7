"""``python -m clid.saliency.emlnet``: EML-Net saliency maps (the code: ``clid.method.emlnet``)."""
from clid.method.emlnet import main
from clid.run.cli import run_main

if __name__ == "__main__":
    run_main(main)
