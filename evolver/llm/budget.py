"""The budget guard: refuses a model call that would go past a cap.

Caps come from ``[budget]``: tokens and dollars per day for everything, per
task, and a share of the day for background work. Spending is read from the
store's ledger, so it survives restarts and counts every process's calls.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from memory.roles import CallLedger

from ..config import BudgetSettings

__all__ = ["BudgetGuard", "BudgetExceeded", "BACKGROUND_PURPOSES"]

BACKGROUND_PURPOSES = ("distill", "synthesize", "propose", "evaluate")


class BudgetExceeded(Exception):
    """A cap would be passed; the message names the cap, what is spent and what was asked."""


def start_of_day(now: float | None = None) -> float:
    t = time.localtime(now if now is not None else time.time())
    return time.mktime((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0, 0, 0, -1))


@dataclass
class BudgetGuard:
    settings: BudgetSettings
    ledger: CallLedger

    def check(self, *, purpose: str, tokens: int, task_id: str | None = None) -> None:
        """Raise ``BudgetExceeded`` if spending ``tokens`` more would pass a cap."""
        s = self.settings
        day = start_of_day()
        day_tokens, day_usd = self.ledger.spent(since=day)
        self._against("daily token cap", s.tokens_per_day, day_tokens, tokens)
        self._against("daily dollar cap", s.usd_per_day, day_usd, 0, usd=True)
        if purpose in BACKGROUND_PURPOSES:
            bg_tokens, bg_usd = self.ledger.spent(since=day, purpose=BACKGROUND_PURPOSES)
            self._against("background token share", int(s.tokens_per_day * s.background_share), bg_tokens, tokens)
            self._against("background dollar share", s.usd_per_day * s.background_share, bg_usd, 0, usd=True)
        if task_id is not None:
            task_tokens, task_usd = self.ledger.spent(task_id=task_id)
            self._against("per-task token cap", s.tokens_per_task, task_tokens, tokens)
            self._against("per-task dollar cap", s.usd_per_task, task_usd, 0, usd=True)

    @staticmethod
    def _against(name: str, cap: float, spent: float, asked: float, *, usd: bool = False) -> None:
        if not cap:
            return  # 0 means no cap
        # Tokens can be estimated before the call; dollars only after it, so a
        # dollar cap refuses the call once what is already spent reaches it.
        passed = spent >= cap if usd else spent + asked > cap
        if passed:
            unit = "USD" if usd else "tokens"
            raise BudgetExceeded(
                f"budget: the {name} of {cap:g} {unit} would be passed "
                f"({spent:g} spent, {asked:g} more asked); raise it in [budget] or wait."
            )
