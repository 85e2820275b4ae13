"""Clients of services outside the package: the OpenAI-compatible chat endpoint (`chat_endpoint`)."""
