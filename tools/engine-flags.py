#!/usr/bin/env python3
"""Print the flags an engine's own command-line parser accepts, as the JSON that validation reads.

Recipes' ``engine_args`` are checked against these lists before any host is
contacted (plugins/module_utils/engines/flags/ENGINE-VERSION.json). Each list
is made by this script from the engine's real parser, so it says exactly
what the engine version it names accepts: run it where that engine is
installed, best inside the very image the recipe pins::

    docker run --rm -i --entrypoint python3 IMAGE - vllm < tools/engine-flags.py \\
        > plugins/module_utils/engines/flags/vllm-VERSION.json
    python3 tools/engine-flags.py sglang > plugins/module_utils/engines/flags/sglang-VERSION.json

For vLLM it builds ``vllm serve``'s parser the way the ``vllm`` command does
(``ServeSubcommand.subparser_init``); for SGLang, ``sglang.launch_server``'s
(``ServerArgs.add_cli_args``). The engine must import on the machine it runs
on; no GPU is needed (vLLM on a machine without one: VLLM_TARGET_DEVICE=cpu,
which changes defaults, not the flags). Standard library apart from the engine itself.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from typing import Dict, List


def _vllm_parser() -> "tuple[argparse.ArgumentParser, str, str]":
    import vllm
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(prog="vllm")
    parser = ServeSubcommand().subparser_init(top.add_subparsers())
    return parser, str(vllm.__version__), "vllm serve (vllm.entrypoints.cli.serve.ServeSubcommand)"


def _sglang_parser() -> "tuple[argparse.ArgumentParser, str, str]":
    from sglang.srt.server_args import ServerArgs
    from sglang.version import __version__

    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    return parser, str(__version__), "python3 -m sglang.launch_server (sglang.srt.server_args.ServerArgs.add_cli_args)"


PARSERS = {"vllm": _vllm_parser, "sglang": _sglang_parser}


def flags_of(parser: argparse.ArgumentParser) -> Dict[str, str]:
    """Each long option of PARSER without its dashes: "switch" when it takes no value, else "value"."""
    flags: Dict[str, str] = {}
    for action in parser._actions:  # argparse keeps no public list of its actions
        if isinstance(action, argparse._HelpAction):
            continue
        kind = "switch" if action.nargs == 0 else "value"
        for option in action.option_strings:
            if option.startswith("--"):
                flags[option[2:]] = kind
    return dict(sorted(flags.items()))


def main(argv: List[str]) -> int:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("engine", choices=sorted(PARSERS))
    cli.add_argument("--made-from", default="",
                     help="where the engine came from, kept in the list (an image digest, a PyPI release)")
    args = cli.parse_args(argv)
    parser, version, source = PARSERS[args.engine]()
    document = {
        "engine": args.engine,
        "version": version,
        "parser": source,
        "made_from": args.made_from,
        "generated": datetime.date.today().isoformat(),
        "generated_by": "tools/engine-flags.py",
        "flags": flags_of(parser),
    }
    json.dump(document, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
