"""The process's entry point: ``kopf-operators run …`` (or ``python -m kopf_operators run …``) is
Kopf's own command line, with Kopf's internals patched first by the one door,
``kopf_operators.core.kopf_patches.door.install()`` (it must run before ``kopf run`` starts the operator:
Kopf binds its event processor then). Every argument is Kopf's. Plain ``kopf run`` works too, unpatched.
"""

from __future__ import annotations

import kopf.cli

from kopf_operators.core.kopf_patches.door import install


def main() -> None:
    install()
    kopf.cli.main()


if __name__ == "__main__":
    main()
