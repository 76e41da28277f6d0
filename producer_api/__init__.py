"""Conveyor's producer: a small FastAPI app that validates requests and enqueues them."""
