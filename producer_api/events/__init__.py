"""The job-events resource: `GET /v1/jobs/{id}/events`, server-sent events with resume."""
