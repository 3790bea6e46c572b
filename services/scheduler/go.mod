module github.com/shizu-gpu/shizu/services/scheduler

go 1.26.8
