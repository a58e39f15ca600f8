"""Worker side of the streaming engine: work budgets, endpoint sets (pure logic, no Spark)."""
