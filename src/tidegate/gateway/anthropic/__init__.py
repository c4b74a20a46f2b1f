"""Anthropic's Messages API: its routes (`routes`), bodies (`schemas`) and dialect (`dialect`),
translated to and from the chat jobs every other surface queues."""
