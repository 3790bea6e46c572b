module github.com/shizu-gpu/shizu/services/node-agent

go 1.26.8
