"""The layout room: one candidate placement and the space of them. The decisions a layout makes, declared once
(decisions), ``Degrees`` / ``Layout`` with every mesh rule (layout), pipeline splits (splits), pipeline schedules
(schedules) and the candidate space with ``--fix`` pins (space). Imports core only."""
