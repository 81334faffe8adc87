"""Worker applications the job-queue tests start as real worker processes."""
