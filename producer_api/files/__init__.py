"""The files resource (`/v1/files`, OpenAI's Files API for batches): input files uploaded for
`POST /v1/batches` by `input_file_id`, and the content of a batch's output and errors files."""
