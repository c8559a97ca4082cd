"""What the warehouse's records mean, decided once for every rule, report and command:
metric direction, evaluations and what they evaluated, and (moving here) cost, usage and
attribution."""
