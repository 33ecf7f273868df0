"""``python -m recurrl._ext [--verbose]``: compile recurrl's C++ kernels ahead of time and
print where they are cached."""

from __future__ import annotations

import argparse
import sys

from recurrl import _ext


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m recurrl._ext", description="Compile recurrl's C++ kernels."
    )
    parser.add_argument("--verbose", action="store_true", help="show the compiler's commands")
    args = parser.parse_args(argv)
    reason = _ext.extension_unavailable_reason()
    if reason is not None:
        print(f"recurrl: cannot build its C++ kernels: {reason}", file=sys.stderr)
        return 1
    _ext.load_extension(verbose=args.verbose)
    print(f"recurrl C++ kernels built and loaded from {_ext.build_directory()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
