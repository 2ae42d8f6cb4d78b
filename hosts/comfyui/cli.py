"""``berth comfyui …``: the ComfyUI host's subcommands.

    berth comfyui install COMFYUI_DIR [--python PATH] [--from CHECKOUT_OR_WHEEL]

Installs Berth into ComfyUI's own Python and the node into its ``custom_nodes/``
(:mod:`.install`), printing each step. Exit status 0, or 2 with one message. Nothing heavy is
imported until the command runs.
"""

from __future__ import annotations

import sys

__all__ = ["arguments"]


def _cmd_install(args) -> int:
    from .install import InstallError, install
    try:
        install(args.comfyui_dir, python=args.python, source=args.source)
    except InstallError as e:
        print(f"berth comfyui install: {e}", file=sys.stderr)
        return 2
    return 0


def arguments(p) -> None:
    """Fill ``berth comfyui``'s parser with its subcommand ``install``
    (:data:`berth.cli.COMMANDS`)."""
    p.description = ("Glue for ComfyUI, which leases itself through Berth's custom node "
                     "(hosts/comfyui/README.md).")
    csub = p.add_subparsers(dest="comfyui_command", metavar="SUBCOMMAND")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
    i = csub.add_parser(
        "install", help="install Berth into ComfyUI's Python and the node into custom_nodes/",
        description="Install Berth into the Python ComfyUI runs with (found from the folder: "
                    "venv/, .venv/ or the portable python_embeded/; Python 3.11 or newer) and "
                    "copy Berth's node into COMFYUI_DIR/custom_nodes/berth-comfyui. Linux "
                    "only.")
    i.add_argument("comfyui_dir", metavar="COMFYUI_DIR", help="the folder with ComfyUI's main.py")
    i.add_argument("--python", metavar="PATH",
                   help="ComfyUI's Python, when it is not found from the folder")
    i.add_argument("--from", dest="source", metavar="PATH",
                   help="a Berth checkout or a wheel built from one (default: the checkout "
                        "this berth runs from; berth-gpu is not on PyPI yet)")
    i.set_defaults(func=_cmd_install)
