"""Draft sources. Each follows the ``Drafter`` lifecycle in ``base``."""

from toolspec.drafters.base import DraftRequest, Drafter, NoDrafter
from toolspec.drafters.oracle import OracleDrafter
from toolspec.drafters.prompt_lookup import PromptLookupDrafter

__all__ = ["DraftRequest", "Drafter", "NoDrafter", "OracleDrafter", "PromptLookupDrafter"]
