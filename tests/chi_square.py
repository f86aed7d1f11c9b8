"""The pooled chi-square the distribution tests share: observed counts per outcome against the exact probabilities."""
import numpy as np
from scipy.stats import chisquare


def pooled_pvalue(counts: dict, exact: dict, trials: int) -> tuple[float, int]:
    """(p-value, cells): counts[outcome] over `trials` draws against exact[outcome] probabilities; cells expecting
    fewer than 5 draws are pooled into one so the chi-square approximation holds."""
    cells = sorted(exact, key=exact.get, reverse=True)
    exp = np.array([exact[c] * trials for c in cells])
    obs = np.array([counts.get(c, 0) for c in cells], dtype=float)
    big = exp >= 5
    f_exp, f_obs = np.append(exp[big], exp[~big].sum()), np.append(obs[big], obs[~big].sum())
    keep = f_exp > 0
    return chisquare(f_obs[keep], f_exp[keep] * f_obs[keep].sum() / f_exp[keep].sum()).pvalue, int(keep.sum())
