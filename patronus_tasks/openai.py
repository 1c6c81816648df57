"""OpenAI-compatible models and judges over HTTP: tasks, LLM judges, one chat call."""

from patronus_tasks.exceptions import UnparseableResponseError
from patronus_tasks.integrations.openai import ChatTask, LLMJudge, chat_completion, openai_endpoint

__all__ = ["ChatTask", "LLMJudge", "UnparseableResponseError", "chat_completion", "openai_endpoint"]
