"""The security suite: every attack this package defends against, as a test that fails on
code that does not defend against it. The threat model is the README's "Security" section:
model output, datasets and names are untrusted input; the server asks who you are.

Sections (each owned by one part of the defence): the SQL sandbox, Markdown this package
writes, the server's authentication, names and other input.
"""

from __future__ import annotations


# ---------------------------------------------------------------------------------------
# 1. The SQL sandbox: sql_result_match runs the model's query with no files, network,
#    extensions or settings, one statement, within its timeout and result caps.
# ---------------------------------------------------------------------------------------


# (end of the SQL sandbox section)



# ---------------------------------------------------------------------------------------
# 2. Untrusted text is text in every Markdown this package writes.
# ---------------------------------------------------------------------------------------


# (end of the Markdown section)



# ---------------------------------------------------------------------------------------
# 3. A server that asks who you are.
# ---------------------------------------------------------------------------------------


# (end of the server section)



# ---------------------------------------------------------------------------------------
# 4. Names cannot collide; the report's template; credentials in URLs; huge datasets.
# ---------------------------------------------------------------------------------------


# (end of the names section)
