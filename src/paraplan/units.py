"""The only place with unit prefixes, conversions and formatting.

Inside paraplan everything is SI base units: seconds, bytes, FLOPs, FLOP/s, bytes/s.
Decimal prefixes (GB, TB/s, TFLOP/s, Gb/s) follow datasheets; binary ones (GiB) follow
memory reports (Korthikanti et al. and torch report GiB).
"""

from __future__ import annotations

MILLI = 1e-3
KILO = 1e3
MEGA = 1e6
GIGA = 1e9
TERA = 1e12
PETA = 1e15
KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4
BITS_PER_BYTE = 8
SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0
SECONDS_PER_YEAR = 365.25 * SECONDS_PER_DAY  # Julian year
JOULES_PER_KWH = 3.6e6


def tflops(x: float) -> float:
    """TFLOP/s -> FLOP/s."""
    return x * TERA


def gbytes(x: float) -> float:
    """GB (decimal) -> bytes."""
    return x * GIGA


def gibytes(x: float) -> float:
    """GiB (binary) -> bytes."""
    return x * GIB


def gbytes_per_s(x: float) -> float:
    """GB/s -> bytes/s."""
    return x * GIGA


def gbits_per_s(x: float) -> float:
    """Gb/s (network line rate) -> bytes/s."""
    return x * GIGA / BITS_PER_BYTE


def us(x: float) -> float:
    """microseconds -> seconds."""
    return x * 1e-6


def to_gib(num_bytes: float) -> float:
    return num_bytes / GIB


def to_tflops(flops_per_s: float) -> float:
    return flops_per_s / TERA


def to_ms(seconds: float) -> float:
    return seconds * 1e3


def fmt_time(seconds: float) -> str:
    """Human time: us / ms / s / min / h / days."""
    if seconds != seconds:  # NaN
        return "nan"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.1f} ms"
    if seconds < 600.0:
        return f"{seconds:.2f} s"
    if seconds < 3 * SECONDS_PER_HOUR:
        return f"{seconds / 60.0:.1f} min"
    if seconds < 3 * SECONDS_PER_DAY:
        return f"{seconds / SECONDS_PER_HOUR:.1f} h"
    if seconds < 10 * SECONDS_PER_YEAR:
        return f"{seconds / SECONDS_PER_DAY:.1f} days"
    return f"{seconds / SECONDS_PER_YEAR:.3g} years"


def fmt_bytes(num_bytes: float) -> str:
    """Binary units (GiB), as memory is reported by allocators."""
    if num_bytes >= TIB:
        return f"{num_bytes / TIB:.2f} TiB"
    if num_bytes >= GIB:
        return f"{num_bytes / GIB:.2f} GiB"
    if num_bytes >= MIB:
        return f"{num_bytes / MIB:.1f} MiB"
    return f"{num_bytes / KIB:.1f} KiB"


def fmt_count(x: float) -> str:
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.2f}{suffix}"
    return f"{x:.0f}"


def fmt_flops_rate(flops_per_s: float) -> str:
    return f"{flops_per_s / TERA:.0f} TFLOP/s"


def fmt_bw(bytes_per_s: float) -> str:
    """Decimal units, as datasheets quote links and memory (GB/s, TB/s)."""
    if bytes_per_s >= TERA:
        return f"{bytes_per_s / TERA:.2f} TB/s"
    if bytes_per_s >= GIGA:
        return f"{bytes_per_s / GIGA:.0f} GB/s"
    return f"{bytes_per_s / MEGA:.0f} MB/s"


def fmt_usd(x: float) -> str:
    if x >= 1e12:
        return f"${x:.3g}"
    if x >= 1e9:
        return f"${x / 1e9:.2f}B"
    if x >= 1e6:
        return f"${x / 1e6:.2f}M"
    if x >= 1e3:
        return f"${x / 1e3:.1f}k"
    return f"${x:.2f}"


def fmt_energy_j(joules: float) -> str:
    mwh = joules / (1000.0 * JOULES_PER_KWH)
    if mwh >= 1:
        return f"{mwh:.1f} MWh"
    return f"{joules / JOULES_PER_KWH:.1f} kWh"


def fmt_co2e_kg(kg: float) -> str:
    """Carbon dioxide equivalent: tonnes from one tonne on, else kilograms."""
    if kg >= 1000.0:
        return f"{kg / 1000.0:,.1f} tCO2e"
    return f"{kg:.1f} kg CO2e"
