module github.com/shizu-gpu/shizu/services/failover

go 1.26.8
