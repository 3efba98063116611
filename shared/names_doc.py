"""Write (or check) docs/training_backend_names.md from the name registry.

    python3 shared/names_doc.py            # write the doc
    python3 shared/names_doc.py --check    # exit 1 when the committed doc is stale

Loads packages/cake-core/src/cake_core/names.py from its file alone: standard library only,
no torch (``nox -s names_doc`` runs it without an environment).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAMES = ROOT / "packages" / "cake-core" / "src" / "cake_core" / "names.py"
DOC = ROOT / "docs" / "training_backend_names.md"


def load_names():
    spec = importlib.util.spec_from_file_location("_cake_names", NAMES)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["_cake_names"] = mod  # dataclasses look the module up
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="exit 1 when the committed doc is stale; write nothing")
    args = ap.parse_args(argv)
    text = load_names().render_names_doc()
    if args.check:
        if not DOC.is_file() or DOC.read_text() != text:
            print(f"stale: {DOC.relative_to(ROOT)}; run: nox -s names_doc")
            return 1
        print(f"{DOC.relative_to(ROOT)} matches the registry")
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
