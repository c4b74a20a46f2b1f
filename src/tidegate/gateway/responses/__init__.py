"""OpenAI's Responses API: its routes (`routes`), bodies (`schemas`) and dialect (`dialect`), a
request as the chat body of its job (`input`), a job as a Responses object (`output`) and as typed
stream events (`stream`), and stored responses found by id (`lookup`)."""
