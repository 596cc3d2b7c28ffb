// The streamer's one job thread: decodes and recomputes run on it, in submission order, while the
// run's thread reads the next chunk from the socket.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace kvscope {

// Runs jobs one after another on its own thread, in submission order. A held worker queues jobs
// without starting them until release() (drain() releases it first); destroyed while held, it drops them.
class Worker {
public:
    explicit Worker(bool held = false);
    // Runs the jobs already queued (unless held), then joins the thread.
    ~Worker();
    void release();
    void submit(std::function<void()> job);
    // Waits until every submitted job has run; rethrows the first job's exception.
    void drain();

private:
    void loop();
    std::mutex m_mutex, m_errMutex;
    std::condition_variable m_cv;
    std::deque<std::function<void()>> m_jobs;
    bool m_busy = false, m_quit = false, m_held = false;
    std::exception_ptr m_error;
    std::thread m_thread;
};

}  // namespace kvscope
