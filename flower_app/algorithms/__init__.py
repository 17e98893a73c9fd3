"""Algorithm math as plain numpy functions, shared by strategies and the direct engine."""
