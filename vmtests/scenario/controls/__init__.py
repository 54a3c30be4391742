"""The negative controls: declared once each, proven on a recorded snapshot and on a guest
(``vmtests.scenario`` says how the groups fit)."""
