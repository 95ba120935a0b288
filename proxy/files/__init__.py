"""The file APIs (proxy layer): the proxy's own attachments (``attachments``), and the OpenAI,
Anthropic (``sdk``) and Gemini (``gemini``) Files APIs, whose image uploads become attachments."""
