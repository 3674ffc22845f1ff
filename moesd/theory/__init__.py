"""The paper's theory, pure numpy: activated experts (Eqs. 6-10), SD speedup (Eqs. 2-5), rooflines (Eq. 1) and
their smooth growth G (Eq. 11)."""
