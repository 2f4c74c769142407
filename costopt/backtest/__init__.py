"""Backtests on real price history: the engine shared by every policy (:mod:`.engine`), price grids
(:mod:`.grid`) and the dynamic-pricing paper's analysis (:mod:`.paper`)."""
