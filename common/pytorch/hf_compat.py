"""The names huggingface_hub 0.x had and 1.0 removed, as the vendor's zoo (R1.6, written for
huggingface_hub 0.0.12) imports them: ``zoo port migrate`` rewrites
``from huggingface_hub import HfApi, HfFolder, Repository`` to take the last two from here.

``HfFolder.get_token`` is huggingface_hub's ``get_token()`` (the token of ``hf auth login`` or
HF_TOKEN; None without one). ``Repository`` (a git clone of a Hub repository, which the
vendor's ``push_to_hub`` drives) is not provided: making one is one error line.
"""

from __future__ import annotations

import huggingface_hub

from common.errors import UserError


class HfFolder:
    """huggingface_hub 0.x's token store, read only."""

    @staticmethod
    def get_token() -> str | None:
        return huggingface_hub.get_token()


class Repository:
    """huggingface_hub 0.x's git-backed repository: not provided."""

    def __init__(self, *args, **kwargs):
        raise UserError("huggingface_hub.Repository (a git clone of a Hub repository, which the vendor's "
                        "push_to_hub uses) is gone from huggingface_hub 1.0 and not provided here: upload the "
                        "saved folder with huggingface_hub.HfApi().upload_folder instead")
