"""The executor's tables (attempts) arrive with the executor issue."""
