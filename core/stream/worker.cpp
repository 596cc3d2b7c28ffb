#include "stream/worker.h"

namespace kvscope {

Worker::Worker(bool held) : m_held(held), m_thread([this] { loop(); }) {}

void Worker::release()
{
    {
        std::lock_guard<std::mutex> lock(m_mutex);
        m_held = false;
    }
    m_cv.notify_all();
}

Worker::~Worker()
{
    {
        std::lock_guard<std::mutex> lock(m_mutex);
        m_quit = true;
    }
    m_cv.notify_all();
    m_thread.join();
}

void Worker::submit(std::function<void()> job)
{
    {
        std::lock_guard<std::mutex> lock(m_mutex);
        m_jobs.push_back(std::move(job));
    }
    m_cv.notify_all();
}

void Worker::drain()
{
    release();
    std::unique_lock<std::mutex> lock(m_mutex);
    m_cv.wait(lock, [this] { return m_jobs.empty() && !m_busy; });
    if (m_error) {
        std::exception_ptr e = m_error;
        m_error = nullptr;
        std::rethrow_exception(e);
    }
}

void Worker::loop()
{
    std::unique_lock<std::mutex> lock(m_mutex);
    for (;;) {
        m_cv.wait(lock, [this] { return m_quit || (!m_held && !m_jobs.empty()); });
        if (m_jobs.empty() || m_held) return;
        std::function<void()> job = std::move(m_jobs.front());
        m_jobs.pop_front();
        m_busy = true;
        lock.unlock();
        try {
            job();
        } catch (...) {
            std::lock_guard<std::mutex> g(m_errMutex);
            if (!m_error) m_error = std::current_exception();
        }
        lock.lock();
        m_busy = false;
        m_cv.notify_all();
    }
}

}  // namespace kvscope
