"""The report kind: a long text written chapter by chapter in parallel from one synthesis, sealed, and
mailed as a link (docs/design.md, "Reports and orders"). kind.py declares it; recipe.py is its steps;
reports.py its state changes."""
