"""Billing owns the rate card, the cost of an attempt, budget reservations, orders and spend (DESIGN.md,
section 6). Its tables arrive with the billing issue; until then the executor's budget step is a no-op."""
