"""topk-fedsm: clients with their own item scores pick k items together with FedSM."""
