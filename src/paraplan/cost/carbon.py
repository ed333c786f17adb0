"""Energy at the facility and the carbon it emits.

Patterson et al. 2021 ("Carbon Emissions and Large Neural Network Training", arXiv
2104.10350, Sec. 2): the energy a training run draws is the accelerators' energy times the
data center's power usage effectiveness (PUE: facility power over IT power), and its
operational carbon is that energy times the grid's carbon intensity (tCO2e per MWh). Their
Table 4 prices GPT-3 so: 3,552,000 V100-hours at 330 W measured per chip, PUE 1.10, 1,287 MWh,
0.429 tCO2e/MWh, 552 tCO2e (tests/golden/test_carbon.py).

paraplan's energy is the GPUs' at TDP (an upper bound on what they draw, without hosts and
network), so its carbon is an upper bound of the GPUs' share too. Embodied carbon (making the
GPUs) is not counted. The defaults of PUE and intensity are that GPT-3 row's
(specs/workload.py); set your own with --pue and --grid-kg-per-kwh.
"""

from __future__ import annotations

from ..units import JOULES_PER_KWH


def facility_energy_j(it_energy_j: float, pue: float) -> float:
    """Energy the facility draws for `it_energy_j` of IT (here: GPU) energy."""
    return it_energy_j * pue


def carbon_kg(it_energy_j: float, pue: float, kg_co2e_per_kwh: float) -> float:
    """Operational kg CO2e of `it_energy_j` of IT energy (Patterson et al. 2021, Sec. 2)."""
    return facility_energy_j(it_energy_j, pue) / JOULES_PER_KWH * kg_co2e_per_kwh
